# The Device seam (src/base/device.h): appended to zinf_base. Included from src/CMakeLists.txt
# after zinf_base is defined. CudaDevice is compiled by nvcc when the build has CUDA; otherwise
# a stub answers MakeCudaDevice with Unimplemented.
target_sources(zinf_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/device.cc
  ${CMAKE_CURRENT_LIST_DIR}/host_device.cc
  ${CMAKE_CURRENT_LIST_DIR}/range_ledger.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_rules.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_arena.cc
  ${CMAKE_CURRENT_LIST_DIR}/arena.cc
)
if(ZINF_HAVE_CUDA)
  target_sources(zinf_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_device.cu)
else()
  target_sources(zinf_base PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_device_stub.cc)
endif()
