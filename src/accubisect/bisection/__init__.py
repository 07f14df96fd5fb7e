"""Bisection: the searches over fusion rules and fp32 node sets, their verdicts and answers."""
