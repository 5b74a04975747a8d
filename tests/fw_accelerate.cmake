# fw_accelerate.cmake - (tests added by the lane that owns it)
