"""Settings: each declared once and resolved flag > environment > .env > default.

Settings, each declared once and resolved flag > environment > .env > default; the errors users
read."""
