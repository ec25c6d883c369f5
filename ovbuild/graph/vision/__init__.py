"""Vision towers, one module per family, each building an IR that encodes several images packed into one call;
the opset blocks they share are in `blocks.py`."""
