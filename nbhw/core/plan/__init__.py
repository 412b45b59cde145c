"""The load planner: its arguments, the cell it writes, the estimate, the placement, the plan and the Load form."""
