"""Capture (torch.fx), patterns, planning and materialisation of Q/DQ placement."""
