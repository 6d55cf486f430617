from .ranges import latest, satisfies
from .version import Version, parse

__all__ = ["Version", "latest", "parse", "satisfies"]
