"""GenAI form: the stateful SDPA IRs that stock OpenVINO GenAI 2026.4 loads (it converts them to PagedAttention itself).

Built from the same building blocks as the paged form; only the attention backend and the model boundary differ.
"""
