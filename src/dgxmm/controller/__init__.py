"""The on-demand controller: slots, shared starts, make-room, the memory queue, the idle reaper."""
