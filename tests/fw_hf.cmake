# fw_hf.cmake - (tests added by the lane that owns it)
