"""From TOML (or a mapping) to a validated `Spec`, and back."""
