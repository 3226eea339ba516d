"""Jinja2 templates for node scripts and sbatch scripts (package data: orchestrator.templates)."""
