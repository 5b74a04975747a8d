# fw_fabric.cmake - (tests added by the lane that owns it)
