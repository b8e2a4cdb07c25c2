__version__ = "0.5.9+sim"
__version_tuple__ = (0, 5, 9, "sim")
