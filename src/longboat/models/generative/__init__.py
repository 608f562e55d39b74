"""Generative building blocks any model family shares: flow matching (``flow_matching``) and the DDPM/DDIM noise
schedule (``ddpm``); plain functions and tables, no parameters."""
