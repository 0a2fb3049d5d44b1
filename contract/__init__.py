"""What every side of tpupod shares and nothing else. A leaf: it imports no other tpupod package."""
