"""Native weight compression: round-to-nearest int8 / int4 quantizers in numpy (`rtn`), OpenVINO's u4/i4 nibble
packing (`nibbles`) and the decompression subgraph the CPU and GPU plugins fuse into compressed kernels
(`decompression`). `WeightPolicy.matrix` in `ovbuild/graph/weights.py` is the one place that uses them."""
