"""File formats: the dumps, configs, models, samples and switch files the stages read and write."""
