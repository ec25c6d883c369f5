"""Vision towers, one module per family, and the opset blocks they share (`blocks.py`)."""
