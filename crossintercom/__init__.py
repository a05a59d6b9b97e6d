"""crossintercom: a mailbox for agent sessions and programs on one or several machines."""

from crossintercom.errors import CrossintercomError

__version__ = "0.1.0"

__all__ = ["CrossintercomError", "__version__"]
