# fw_lightning.cmake - (tests added by the lane that owns it)
