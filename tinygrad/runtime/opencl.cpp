// OpenCL runtime. Devices are numbered over all platforms in platform order: CL is the first,
// CL:1 the second. Every cl* call goes through CL_CALL, which names the call and the decoded
// error. Buffers are cl_mem handles; kernels run on one in-order queue with profiling, so a
// launch that waits reports the kernel's own time from its event.
#define CL_TARGET_OPENCL_VERSION 120
#include "tinygrad/runtime/opencl.h"

#include <CL/cl.h>

#include <limits>
#include <mutex>
#include <vector>

#include "tinygrad/codegen/render_opencl.h"
#include "tinygrad/error.h"

namespace tg {

std::string cl_error_name(int code) {
  switch (code) {
#define E(x) case x: return #x;
    E(CL_SUCCESS) E(CL_DEVICE_NOT_FOUND) E(CL_DEVICE_NOT_AVAILABLE) E(CL_COMPILER_NOT_AVAILABLE)
    E(CL_MEM_OBJECT_ALLOCATION_FAILURE) E(CL_OUT_OF_RESOURCES) E(CL_OUT_OF_HOST_MEMORY)
    E(CL_PROFILING_INFO_NOT_AVAILABLE) E(CL_MEM_COPY_OVERLAP) E(CL_BUILD_PROGRAM_FAILURE) E(CL_MAP_FAILURE)
    E(CL_MISALIGNED_SUB_BUFFER_OFFSET) E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) E(CL_COMPILE_PROGRAM_FAILURE)
    E(CL_LINKER_NOT_AVAILABLE) E(CL_LINK_PROGRAM_FAILURE) E(CL_INVALID_VALUE) E(CL_INVALID_DEVICE_TYPE)
    E(CL_INVALID_PLATFORM) E(CL_INVALID_DEVICE) E(CL_INVALID_CONTEXT) E(CL_INVALID_QUEUE_PROPERTIES)
    E(CL_INVALID_COMMAND_QUEUE) E(CL_INVALID_HOST_PTR) E(CL_INVALID_MEM_OBJECT) E(CL_INVALID_BINARY)
    E(CL_INVALID_BUILD_OPTIONS) E(CL_INVALID_PROGRAM) E(CL_INVALID_PROGRAM_EXECUTABLE) E(CL_INVALID_KERNEL_NAME)
    E(CL_INVALID_KERNEL_DEFINITION) E(CL_INVALID_KERNEL) E(CL_INVALID_ARG_INDEX) E(CL_INVALID_ARG_VALUE)
    E(CL_INVALID_ARG_SIZE) E(CL_INVALID_KERNEL_ARGS) E(CL_INVALID_WORK_DIMENSION) E(CL_INVALID_WORK_GROUP_SIZE)
    E(CL_INVALID_WORK_ITEM_SIZE) E(CL_INVALID_GLOBAL_OFFSET) E(CL_INVALID_EVENT_WAIT_LIST) E(CL_INVALID_EVENT)
    E(CL_INVALID_OPERATION) E(CL_INVALID_BUFFER_SIZE) E(CL_INVALID_GLOBAL_WORK_SIZE) E(CL_INVALID_PROPERTY)
#undef E
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "CL error " + std::to_string(code);
  }
}

#define CL_CALL(call, ...)                                                                                   \
  do {                                                                                                       \
    cl_int tg_cl_err_ = (call);                                                                              \
    TG_CHECK(tg_cl_err_ == CL_SUCCESS, #call, " failed: ", cl_error_name(tg_cl_err_) __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

namespace {

std::vector<cl_device_id> all_devices() {
  cl_uint np = 0;
  cl_int err = clGetPlatformIDs(0, nullptr, &np);
  if (err != CL_SUCCESS || np == 0) return {};
  std::vector<cl_platform_id> platforms(np);
  CL_CALL(clGetPlatformIDs(np, platforms.data(), nullptr));
  std::vector<cl_device_id> out;
  for (auto p : platforms) {
    cl_uint nd = 0;
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS || nd == 0) continue;
    std::vector<cl_device_id> ds(nd);
    CL_CALL(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, ds.data(), nullptr));
    out.insert(out.end(), ds.begin(), ds.end());
  }
  return out;
}

std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  CL_CALL(clGetDeviceInfo(d, what, 0, nullptr, &n));
  std::string s(n, '\0');
  CL_CALL(clGetDeviceInfo(d, what, n, s.data(), nullptr));
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

class CLAllocator : public Allocator {
 public:
  CLAllocator(cl_context ctx, cl_command_queue q) : ctx_(ctx), q_(q) {}
  void* alloc(size_t bytes) override {
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(ctx_, CL_MEM_READ_WRITE, bytes, nullptr, &err);
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY) return nullptr;
    CL_CALL(err, " (clCreateBuffer of ", bytes, " bytes)");
    return m;
  }
  void free(void* ptr, size_t) override { clReleaseMemObject(static_cast<cl_mem>(ptr)); }
  void copy_in(void* dst, const void* src, size_t bytes) override {
    CL_CALL(clEnqueueWriteBuffer(q_, static_cast<cl_mem>(dst), CL_TRUE, 0, bytes, src, 0, nullptr, nullptr));
  }
  void copy_out(void* dst, const void* src, size_t bytes) override {
    CL_CALL(clEnqueueReadBuffer(q_, static_cast<cl_mem>(const_cast<void*>(src)), CL_TRUE, 0, bytes, dst, 0, nullptr, nullptr));
  }

 private:
  cl_context ctx_;
  cl_command_queue q_;
};

class CLProgram : public Program {
 public:
  CLProgram(cl_program prog, cl_kernel kernel, cl_command_queue q, std::string name)
      : prog_(prog), kernel_(kernel), q_(q), name_(std::move(name)) {}
  ~CLProgram() override {
    clReleaseKernel(kernel_);
    clReleaseProgram(prog_);
  }
  std::optional<double> launch(const std::vector<void*>& buffers, const std::vector<int64_t>& global_size,
                               const std::vector<int64_t>& local_size, bool wait) override {
    TG_ASSERT(!global_size.empty() && global_size.size() <= 3, "OpenCL kernel '", name_, "' launched with ",
              global_size.size(), " dimensions");
    std::lock_guard<std::mutex> lock(mu_);  // kernel arguments are state of the kernel object
    for (size_t i = 0; i < buffers.size(); i++) {
      cl_mem m = static_cast<cl_mem>(buffers[i]);
      CL_CALL(clSetKernelArg(kernel_, static_cast<cl_uint>(i), sizeof(cl_mem), &m), " (kernel ", name_, ", arg ", i, ")");
    }
    size_t g[3], l[3];
    for (size_t d = 0; d < global_size.size(); d++) {
      g[d] = static_cast<size_t>(global_size[d]);
      l[d] = d < local_size.size() ? static_cast<size_t>(local_size[d]) : 1;
    }
    cl_event ev = nullptr;
    CL_CALL(clEnqueueNDRangeKernel(q_, kernel_, static_cast<cl_uint>(global_size.size()), nullptr, g,
                                   local_size.empty() ? nullptr : l, 0, nullptr, wait ? &ev : nullptr),
            " (kernel ", name_, ")");
    if (!wait) return std::nullopt;
    CL_CALL(clWaitForEvents(1, &ev), " (kernel ", name_, ")");
    cl_ulong t0 = 0, t1 = 0;
    CL_CALL(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof(t0), &t0, nullptr));
    CL_CALL(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof(t1), &t1, nullptr));
    clReleaseEvent(ev);
    return static_cast<double>(t1 - t0) * 1e-9;
  }

 private:
  cl_program prog_;
  cl_kernel kernel_;
  cl_command_queue q_;
  std::string name_;
  std::mutex mu_;
};

class CLCompiler : public Compiler {
 public:
  CLCompiler(cl_context ctx, cl_device_id dev, cl_command_queue q, std::string key)
      : ctx_(ctx), dev_(dev), q_(q), key_(std::move(key)) {}
  std::string cache_key() const override { return key_; }
  std::unique_ptr<Program> compile(const std::string& name, const std::string& source) override {
    const char* src = source.c_str();
    size_t len = source.size();
    cl_int err = CL_SUCCESS;
    cl_program prog = clCreateProgramWithSource(ctx_, 1, &src, &len, &err);
    CL_CALL(err, " (kernel ", name, ")");
    err = clBuildProgram(prog, 1, &dev_, "", nullptr, nullptr);
    if (err != CL_SUCCESS) {
      size_t n = 0;
      clGetProgramBuildInfo(prog, dev_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
      std::string log(n, '\0');
      clGetProgramBuildInfo(prog, dev_, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
      clReleaseProgram(prog);
      throw CompileError(
          name, source,
          detail::cat("OpenCL kernel '", name, "' failed to build (", cl_error_name(err), "):\n", log));
    }
    cl_kernel k = clCreateKernel(prog, name.c_str(), &err);
    if (err != CL_SUCCESS) clReleaseProgram(prog);
    CL_CALL(err, " (kernel ", name, ")");
    return std::make_unique<CLProgram>(prog, k, q_, name);
  }

 private:
  cl_context ctx_;
  cl_device_id dev_;
  cl_command_queue q_;
  std::string key_;
};

class CLDevice : public Device {
 public:
  CLDevice(const std::string& name, cl_device_id dev) : Device(name), dev_(dev) {
    cl_int err = CL_SUCCESS;
    ctx_ = clCreateContext(nullptr, 1, &dev_, nullptr, nullptr, &err);
    CL_CALL(err, " (device ", name, ")");
    queue_ = clCreateCommandQueue(ctx_, dev_, CL_QUEUE_PROFILING_ENABLE, &err);
    CL_CALL(err, " (device ", name, ")");
    std::string ext = device_string(dev_, CL_DEVICE_EXTENSIONS);
    fp16_ = ext.find("cl_khr_fp16") != std::string::npos;
    size_t max_wg = 0;
    CL_CALL(clGetDeviceInfo(dev_, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(max_wg), &max_wg, nullptr));
    GpuLimits lim;
    while (lim.max_local > static_cast<int64_t>(max_wg)) lim.max_local /= 2;
    while (lim.group_threads > static_cast<int64_t>(max_wg)) lim.group_threads /= 2;
    lim.max_group_threads = lim.max_group_z = static_cast<int64_t>(max_wg);
    lim.max_groups_x = lim.max_groups_yz = std::numeric_limits<int64_t>::max();
    policy_ = DevicePolicy{.gpu = lim,
                           .channels_last_convolutions = false,
                           .pad_aliasing_rows = false,
                           .split_reductions = true,
                           .realize_product_operands = false};
    desc_ = name + " (" + device_string(dev_, CL_DEVICE_NAME) + ", " + device_string(dev_, CL_DEVICE_VERSION) + ")";
    renderer_ = std::make_unique<OpenCLRenderer>(fp16_);
    allocator_ = std::make_unique<CLAllocator>(ctx_, queue_);
    compiler_ = std::make_unique<CLCompiler>(ctx_, dev_, queue_, "opencl:" + desc_ + " " + device_string(dev_, CL_DRIVER_VERSION));
  }
  Allocator& allocator() override { return *allocator_; }
  const Renderer& renderer() const override { return *renderer_; }
  Compiler& compiler() override { return *compiler_; }
  void synchronize() override { CL_CALL(clFinish(queue_), " (device ", name(), ")"); }
  // float16 works either way: natively with cl_khr_fp16, else as storage (render_opencl.cpp).
  bool supports(Feature f) const override { return f == Feature::Timing || f == Feature::Float16 || f == Feature::BFloat16; }
  const DevicePolicy& policy() const override { return policy_; }
  std::string description() const override { return desc_; }

 private:
  cl_device_id dev_;
  cl_context ctx_ = nullptr;
  cl_command_queue queue_ = nullptr;
  bool fp16_ = false;
  std::string desc_;
  DevicePolicy policy_;
  std::unique_ptr<Renderer> renderer_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Compiler> compiler_;
};

}  // namespace

int opencl_device_count() { return static_cast<int>(all_devices().size()); }

std::unique_ptr<Device> make_opencl_device(const std::string& name) {
  auto colon = name.find(':');
  int index = 0;
  if (colon != std::string::npos) {
    std::string num = name.substr(colon + 1);
    TG_CHECK(!num.empty() && num.size() < 6 && num.find_first_not_of("0123456789") == std::string::npos, "device '",
             name, "': expected CL or CL:<index>");
    index = std::stoi(num);
  }
  auto devices = all_devices();
  TG_CHECK(!devices.empty(), "device '", name, "': no OpenCL platform or device found (is an ICD such as "
           "pocl-opencl-icd installed? see /etc/OpenCL/vendors)");
  TG_CHECK(index < static_cast<int>(devices.size()), "device '", name, "': only ", devices.size(),
           " OpenCL device(s) found (CL", devices.size() > 1 ? " .. CL:" + std::to_string(devices.size() - 1) : std::string(), ")");
  return std::make_unique<CLDevice>(name, devices[static_cast<size_t>(index)]);
}

}  // namespace tg
