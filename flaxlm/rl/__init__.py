"""Reinforcement learning from rewards (run_grpo.py), host side: reward functions and group advantages."""
