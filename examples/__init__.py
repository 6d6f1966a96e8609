"""Examples of your own training under mgpu-env (README, "Your own model")."""
