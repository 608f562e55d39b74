"""Robot data: LeRobot datasets, their statistics, and the transforms a policy trains and serves with."""
