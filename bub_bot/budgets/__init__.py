"""Rate limits, token and money budgets, and usage (issue 23): see book.py."""

from .book import LIMIT_NOTICE, Budgets, Spent, StepUsage, step_usage
from .payer import Payer

__all__ = ["LIMIT_NOTICE", "Budgets", "Payer", "Spent", "StepUsage", "step_usage"]
