"""Tests of bftrainer.trainers: the Pollux agent library."""
