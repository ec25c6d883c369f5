"""ovbuild's version (a leaf module: the IR records stamp it into every IR)."""

__version__ = "0.1.0"
