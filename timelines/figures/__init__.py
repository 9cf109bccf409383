"""Plotly figure builders, arrays in and figure dict out, no ORM and no request (``build``), and
what a lane of the timeline is in each grouping (``lanes``)."""
