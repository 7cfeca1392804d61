# What `cmake --install` puts under the prefix: the public headers (include/tinygradpp/{tinygrad,
# distributed,launcher}/...), the static libraries, `tg`, the CMake package tinygradpp
# (lib/cmake/tinygradpp: find_package(tinygradpp) gives tinygradpp::tinygradpp and the library
# targets) and the pkg-config file lib/pkgconfig/tinygradpp.pc.
#
# Included twice from the top CMakeLists.txt: first for tg_pc_collect (each library's directory
# calls it, where its dependencies' imported targets are visible), then, with
# TG_INSTALL_RULES set, for the install rules once every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Note [pkg-config link line]: tinygradpp.pc lists the four static libraries (launcher first,
# core last) and then what they link: each library's directory calls tg_pc_collect(TARGET)
# once its dependencies are linked, which resolves every dependency that is not one of ours to
# link-line items while the imported targets are visible (they are local to the directory that
# found them): an imported library gives its file (the configuration this build uses, else the
# first it has) and, walked in turn, what it links; an interface target gives what it links; a
# plain name gives -lNAME; a flag stays as it is; Threads::Threads gives -pthread. A shared
# library outside the system directories adds -Wl,-rpath to its directory (LLVM's libLLVM.so).
# Duplicates keep their last place, which a static link line wants.
set(TG_OWN_TARGETS tinygrad tinygrad_nn tinygrad_distributed tg_launcher)
set(TG_SYSTEM_LIB_DIRS /lib /usr/lib /lib64 /usr/lib64 /lib/${CMAKE_LIBRARY_ARCHITECTURE} /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})

function(tg_imported_file target out)
  get_target_property(configs ${target} IMPORTED_CONFIGURATIONS)
  string(TOUPPER "${CMAKE_BUILD_TYPE}" want)
  set(file "")
  if(configs)
    if(NOT want IN_LIST configs)
      list(GET configs 0 want)
    endif()
    get_target_property(file ${target} IMPORTED_LOCATION_${want})
  endif()
  if(NOT file)
    get_target_property(file ${target} IMPORTED_LOCATION)
  endif()
  if(NOT file)
    set(file "")
  endif()
  set(${out} "${file}" PARENT_SCOPE)
endfunction()

function(tg_pc_items items out)
  set(result "")
  foreach(item IN LISTS items)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" item "${item}")
    if(item STREQUAL "" OR item IN_LIST TG_OWN_TARGETS OR item MATCHES "\\$<")
      continue()
    endif()
    if(item STREQUAL "Threads::Threads")
      list(APPEND result "-pthread")
    elseif(TARGET ${item})
      get_target_property(type ${item} TYPE)
      if(NOT type STREQUAL "INTERFACE_LIBRARY")
        tg_imported_file(${item} file)
        if(file)
          list(APPEND result "${file}")
          get_filename_component(dir "${file}" DIRECTORY)
          if(type STREQUAL "SHARED_LIBRARY" AND NOT dir IN_LIST TG_SYSTEM_LIB_DIRS)
            list(APPEND result "-Wl,-rpath,${dir}")
          endif()
        endif()
      endif()
      get_target_property(deps ${item} INTERFACE_LINK_LIBRARIES)
      if(deps)
        tg_pc_items("${deps}" sub)
        list(APPEND result ${sub})
      endif()
      get_target_property(opts ${item} INTERFACE_LINK_OPTIONS)
      if(opts)
        foreach(opt IN LISTS opts)
          if(NOT opt MATCHES "\\$<")
            string(REGEX REPLACE "^SHELL:" "" opt "${opt}")
            list(APPEND result "${opt}")
          endif()
        endforeach()
      endif()
    elseif(item MATCHES "^-" OR IS_ABSOLUTE "${item}")
      list(APPEND result "${item}")
    else()
      list(APPEND result "-l${item}")
    endif()
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# Appends what TARGET links (Note [pkg-config link line]) to the global list TG_PC_LIBS.
function(tg_pc_collect target)
  get_target_property(deps ${target} LINK_LIBRARIES)
  if(deps)
    tg_pc_items("${deps}" items)
    set_property(GLOBAL APPEND PROPERTY TG_PC_LIBS ${items})
  endif()
endfunction()

if(NOT TG_INSTALL_RULES)
  return()
endif()

# ---- install rules (the second include) ----

# Note [installed dependencies]: the libraries are static, so a program that links them also
# links what they link privately (yaml-cpp, CLI11, LLVM, OpenCL, PCRE2, spdlog, ...).
# install(EXPORT) writes those as $<LINK_ONLY:...> of the imported targets, so
# tinygradppConfig.cmake finds the same packages again (find_dependency), only those this build
# has (the TG_HAVE_* flags), and LLVM at the LLVM_DIR this build used unless the caller sets its own.
set(TG_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tinygradpp)
add_library(tinygradpp INTERFACE)
target_link_libraries(tinygradpp INTERFACE tg_launcher)
# The headers are C++20: a program that includes them is compiled as C++20 at least.
target_compile_features(tinygrad PUBLIC cxx_std_20)
set_target_properties(tg PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)

install(TARGETS tinygrad tinygrad_nn tinygrad_distributed tg_launcher tinygradpp tg
        EXPORT tinygradppTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tinygradpp)
# The public headers keep their layout (#include "tinygrad/tensor.h"); those that include the
# CUDA toolkit's or NCCL's headers are the runtime's own and stay behind.
foreach(dir tinygrad distributed launcher)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tinygradpp/${dir}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "cuda_api.h" EXCLUDE PATTERN "cuda_context.h" EXCLUDE PATTERN "cuda_staging.h" EXCLUDE
          PATTERN "nccl_api.h" EXCLUDE)
endforeach()
install(EXPORT tinygradppTargets NAMESPACE tinygradpp:: DESTINATION ${TG_INSTALL_CMAKEDIR})

foreach(flag TG_HAVE_LLVM TG_HAVE_OPENCL TG_HAVE_PCRE2 TG_HAVE_STORE TG_HAVE_GLOO TG_HAVE_MPI TG_HAVE_SPDLOG)
  if(${flag})
    set(${flag} ON)
  else()
    set(${flag} OFF)
  endif()
endforeach()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/tinygradppConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/tinygradppConfig.cmake INSTALL_DESTINATION ${TG_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tinygradppConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tinygradppConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/tinygradppConfigVersion.cmake
        DESTINATION ${TG_INSTALL_CMAKEDIR})

# tinygradpp.pc: the defines the libraries give their users, the link line (Note [pkg-config link line]).
set(TG_PC_CFLAGS "")
foreach(target IN LISTS TG_OWN_TARGETS)
  get_target_property(defs ${target} INTERFACE_COMPILE_DEFINITIONS)
  if(defs)
    foreach(def IN LISTS defs)
      list(APPEND TG_PC_CFLAGS "-D${def}")
    endforeach()
  endif()
endforeach()
list(REMOVE_DUPLICATES TG_PC_CFLAGS)
list(JOIN TG_PC_CFLAGS " " TG_PC_CFLAGS)
get_property(pc_libs GLOBAL PROPERTY TG_PC_LIBS)
list(REVERSE pc_libs)
list(REMOVE_DUPLICATES pc_libs)  # keeps the first of the reversed list: the last of the original
list(REVERSE pc_libs)
list(JOIN pc_libs " " TG_PC_LIBS)
# The prefix is found from the .pc file's own place, so `cmake --install --prefix DIR` works.
file(RELATIVE_PATH TG_PC_PREFIX "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
string(REGEX REPLACE "/$" "" TG_PC_PREFIX "${TG_PC_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/tinygradpp.pc.in ${CMAKE_CURRENT_BINARY_DIR}/tinygradpp.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tinygradpp.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
