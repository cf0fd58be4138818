"""dstack-plan: Terraform-style plan/apply for AI compute, speaking dstack's YAML."""

__version__ = "0.1.0"
