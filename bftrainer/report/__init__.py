"""``bftrainer report``: one self-contained HTML page of what happened, with its PNGs.

Built on the frames (bftrainer/report/frames.py): the headline table (headline.py), the
figures (figures.py) on bins shared by every step function (series.py), and the page
(page.py) that inlines them.
"""
