"""`python -m entrypoint` and the `mgpu` console script."""

from entrypoint.app import main

if __name__ == "__main__":
    main()
