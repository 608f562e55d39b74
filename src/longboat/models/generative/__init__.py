"""Generative building blocks any model family shares: flow matching (``flow_matching``), the DDPM/DDIM noise
schedule (``ddpm``) and keyed randomness (``keyed_random``); plain functions and tables, no parameters."""
