"""Google Compute Engine instances for cloud fleets."""
