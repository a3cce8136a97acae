"""Launching elastic trainers: the Launcher, its detached supervisor, remote execution."""
