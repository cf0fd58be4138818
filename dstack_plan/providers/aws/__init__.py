"""The `aws` provider: EC2 instances priced from the shipped catalogue."""
