"""Attention kernels: the explicit path, SDPA, flex, distance-bias rows and the two-pass merge."""
