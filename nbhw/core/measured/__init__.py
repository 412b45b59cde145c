"""Reports that need both what was measured (memory) and what the planner projects: above plan in the layers."""
