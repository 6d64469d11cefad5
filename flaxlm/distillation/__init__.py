"""Distillation (run_distill.py), host side: the offline teacher's top-k store and the rows each step trains on."""
