"""The centre mode: one allocator for every user of a machine (issue 23)."""
