"""Graph building: OpenVINO opset ops from normalized configs and checkpoint tensors, PagedAttention included."""
