"""Azure virtual machines for cloud fleets."""
