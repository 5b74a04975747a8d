# pkg_install.cmake - (tests added by the lane that owns it)
