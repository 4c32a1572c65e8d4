"""The error every config check raises: a leaf, so any module that checks can raise it."""


class ConfigError(ValueError):
    """A config value volt cannot run with; str(error) is the whole message for the user."""
