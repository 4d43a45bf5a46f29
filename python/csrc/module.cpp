// gradguard._C: the C++ half of the Python module. It binds
//   GuardCore        the guarded step with its snapshot writer and metrics (guard_core.h)
//   StepOutcome      what one step decided and measured, as named read-only fields
//   Anomaly          one finding of the anomaly detector
//   HostReadCounter  core/host_read.h's counter of device->host reads, for tests
//   effective_config the config a set of overrides gives, as YAML (`config show`)
// and turns gradguard::Error into Python exceptions carrying the message (which names
// the file or config key), `where` and `exit_code`: Error (a RuntimeError),
// BadInputError (also a ValueError: a bad key or value), HaltedError.
//
// Tensors cross the boundary as they are (torch/extension.h's caster): the guard works
// on the very .grad tensors of the Python parameters. The pure-Python package
// (python/gradguard/) is the public API; these names are its building blocks.
#include <cmath>
#include <optional>

#include <torch/extension.h>

#include "gradguard/core/error.h"
#include "gradguard/core/host_read.h"
#include "guard_core.h"

namespace py = pybind11;
using gradguard::python::CoreOutcome;
using gradguard::python::CoreStepInputs;
using gradguard::python::GuardCore;
using gradguard::python::GuardCoreCallbacks;
using gradguard::python::GuardCoreOptions;

namespace {

PyObject* g_error = nullptr;      // gradguard._C.Error
PyObject* g_bad_input = nullptr;  // gradguard._C.BadInputError
PyObject* g_halted = nullptr;     // gradguard._C.HaltedError

void raise(const gradguard::Error& e) {
  PyObject* type = e.kind() == gradguard::ErrorKind::kBadInput ? g_bad_input
                   : e.kind() == gradguard::ErrorKind::kHalted ? g_halted
                                                               : g_error;
  py::object exc = py::reinterpret_steal<py::object>(PyObject_CallFunction(type, "s", e.what()));
  if (!exc) return;  // the call failed and set its own exception
  exc.attr("where") = e.where();
  exc.attr("exit_code") = e.exit_code();
  PyErr_SetObject(type, exc.ptr());
}

py::object none_if_nan(double v) { return std::isnan(v) ? py::none() : py::cast(v); }
py::object none_if_empty(const std::string& s) { return s.empty() ? py::none() : py::cast(s); }

// Counting as a context manager: counts from __enter__ (or construction) to __exit__.
class PyHostReadCounter {
 public:
  void start() { counter_.emplace(), final_ = 0; }
  void stop() {
    if (counter_) final_ = counter_->count(), counter_.reset();
  }
  int64_t count() const { return counter_ ? counter_->count() : final_; }

 private:
  std::optional<gradguard::HostReadCounter> counter_;
  int64_t final_ = 0;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gradguard's C++ guard for PyTorch loops (use the gradguard package, not this module)";
  m.attr("__version__") = GRADGUARD_VERSION;

  g_error = PyErr_NewException("gradguard._C.Error", PyExc_RuntimeError, nullptr);
  py::tuple bad_bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_bad_input = PyErr_NewException("gradguard._C.BadInputError", bad_bases.ptr(), nullptr);
  g_halted = PyErr_NewException("gradguard._C.HaltedError", g_error, nullptr);
  m.add_object("Error", py::handle(g_error));
  m.add_object("BadInputError", py::handle(g_bad_input));
  m.add_object("HaltedError", py::handle(g_halted));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const gradguard::Error& e) {
      raise(e);
    }
  });

  m.def(
      "effective_config",
      [](const std::vector<std::string>& overrides) {
        return gradguard::config::to_yaml(gradguard::config::load_config("", overrides));
      },
      py::arg("overrides"), "The configuration the overrides give (defaults + overrides, validated) as YAML.");

  py::class_<PyHostReadCounter>(m, "HostReadCounter",
                                "Counts device->host reads on this thread (core/host_read.h) inside a with block.")
      .def(py::init<>())
      .def("__enter__",
           [](PyHostReadCounter& c) -> PyHostReadCounter& {
             c.start();
             return c;
           },
           py::return_value_policy::reference)
      .def("__exit__", [](PyHostReadCounter& c, py::args) { c.stop(); })
      .def_property_readonly("count", &PyHostReadCounter::count);

  py::class_<gradguard::guard::Anomaly>(m, "Anomaly", "One finding of the anomaly detector.")
      .def_property_readonly("kind", [](const gradguard::guard::Anomaly& a) { return gradguard::name_of(a.kind); })
      .def_property_readonly("severity",
                             [](const gradguard::guard::Anomaly& a) { return gradguard::name_of(a.severity); })
      .def_property_readonly("critical",
                             [](const gradguard::guard::Anomaly& a) {
                               return a.severity == gradguard::guard::Severity::kCritical;
                             })
      .def_readonly("message", &gradguard::guard::Anomaly::message)
      .def_readonly("layers", &gradguard::guard::Anomaly::layers)
      .def_property_readonly("numbers",
                             [](const gradguard::guard::Anomaly& a) {
                               py::dict d;
                               for (const auto& [name, value] : a.numbers) d[py::str(name)] = value;
                               return d;
                             })
      .def("__repr__", [](const gradguard::guard::Anomaly& a) {
        return std::string("<Anomaly ") + gradguard::name_of(a.kind) + " " + gradguard::name_of(a.severity) + ": " +
               a.message + ">";
      });

  using O = CoreOutcome;
  py::class_<O>(m, "StepOutcome", "What one guarded step decided and measured (docs/python.md lists the fields).")
      .def_property_readonly("step", [](const O& o) { return o.outcome.step; })
      .def_property_readonly("applied", [](const O& o) { return o.outcome.applied; })
      .def_property_readonly("skipped", [](const O& o) { return o.outcome.skipped(); })
      .def_property_readonly("loss", [](const O& o) { return o.outcome.loss; })
      .def_property_readonly("micro_losses", [](const O& o) { return o.outcome.micro_losses; })
      .def_property_readonly("lr", [](const O& o) { return o.outcome.lr; })
      .def_property_readonly("injected", [](const O& o) { return none_if_empty(o.outcome.injected); })
      .def_property_readonly("grad_norm", [](const O& o) { return o.outcome.clip.grad_norm; })
      .def_property_readonly("nonfinite", [](const O& o) { return o.outcome.stats.nonfinite; })
      .def_property_readonly("clip_coef", [](const O& o) { return o.outcome.clip.clip_coef; })
      .def_property_readonly("clip_threshold", [](const O& o) { return o.outcome.clip.threshold; })
      .def_property_readonly("loss_scale", [](const O& o) { return o.outcome.loss_scale; })
      .def_property_readonly("next_loss_scale", [](const O& o) { return o.outcome.scaler.next_scale; })
      .def_property_readonly("scale_backed_off", [](const O& o) { return o.outcome.scaler.backed_off; })
      .def_property_readonly("layer_grad_norms",
                             [](const O& o) {
                               py::dict d;
                               const auto& norms = o.outcome.stats.layer_norms;
                               for (size_t k = 0; k < norms.size() && k < o.layer_names->size(); ++k)
                                 d[py::str((*o.layer_names)[k])] = norms[k];
                               return d;
                             })
      .def_property_readonly("grad_norm_forecast",
                             [](const O& o) -> py::object {
                               const auto& f = o.outcome.verdict.forecast;
                               if (!f.ready) return py::none();
                               py::dict d;
                               d["expected"] = f.expected;
                               d["low"] = f.low;
                               d["high"] = f.high;
                               return d;
                             })
      .def_property_readonly("forecast_breach", [](const O& o) { return o.outcome.verdict.forecast.breach; })
      .def_property_readonly("forecast_breach_layers",
                             [](const O& o) { return o.outcome.verdict.forecast_layers; })
      .def_property_readonly("anomalies", [](const O& o) { return o.outcome.verdict.anomalies; })
      .def_property_readonly("critical", [](const O& o) { return o.outcome.verdict.critical(); })
      .def_property_readonly("action",
                             [](const O& o) -> py::object {
                               if (!o.outcome.recovery) return py::none();
                               return py::str(gradguard::name_of(o.outcome.recovery->action));
                             })
      .def_property_readonly("rung",
                             [](const O& o) -> py::object {
                               return o.outcome.recovery ? py::cast(o.outcome.recovery->rung) : py::none();
                             })
      .def_property_readonly("budget_left",
                             [](const O& o) -> py::object {
                               return o.outcome.recovery ? py::cast(o.outcome.recovery->budget_left) : py::none();
                             })
      .def_property_readonly("recovery_note",
                             [](const O& o) -> py::object {
                               return o.outcome.recovery ? none_if_empty(o.outcome.recovery->note) : py::none();
                             })
      .def_property_readonly("rollback", [](const O& o) { return o.outcome.rollback(); })
      .def_property_readonly("reset_params",
                             [](const O& o) {
                               std::vector<std::string> names;
                               for (int64_t i : o.reset_tensors) names.push_back(o.param_names->at(i));
                               return names;
                             })
      .def_readonly("reset_indices", &O::reset_tensors)
      .def_property_readonly("tensors_reset", [](const O& o) { return o.outcome.tensors_reset; })
      .def_property_readonly("snapshot_dir", [](const O& o) { return none_if_empty(o.outcome.snapshot.dir); })
      .def_property_readonly("snapshot_skipped",
                             [](const O& o) { return none_if_empty(o.outcome.snapshot.skipped); })
      .def_property_readonly("halt", [](const O& o) { return o.outcome.halt; })
      .def_property_readonly("halt_message", [](const O& o) { return none_if_empty(o.outcome.halt_message); })
      .def_property_readonly("noise_scale", [](const O& o) { return none_if_nan(o.outcome.noise_scale); })
      .def_property_readonly("z_loss", [](const O& o) { return none_if_nan(o.outcome.z_loss); })
      .def_property_readonly("skip_rule", [](const O& o) { return o.outcome.skip_rule.skip; })
      .def_property_readonly("noise_warning", [](const O& o) { return o.outcome.noise_warning; })
      .def_property_readonly("step_seconds", [](const O& o) { return o.outcome.step_seconds; })
      .def_readwrite("host_reads", &O::host_reads)
      .def("__repr__", [](const O& o) {
        const auto& x = o.outcome;
        char text[256];
        std::snprintf(text, sizeof text, "<StepOutcome step %lld %s loss %.6g grad_norm %.6g clip_coef %.4g%s%s%s>",
                      static_cast<long long>(x.step), x.applied ? "applied" : "skipped", x.loss, x.clip.grad_norm,
                      x.clip.clip_coef, x.recovery ? " action " : "",
                      x.recovery ? gradguard::name_of(x.recovery->action) : "", x.halt ? " HALT" : "");
        return std::string(text);
      });

  py::class_<GuardCore>(m, "GuardCore", "The guarded step of a Python loop (use gradguard.Guard).")
      .def(py::init([](std::vector<at::Tensor> params, std::vector<std::string> names,
                       std::vector<std::string> overrides, std::string run_dir, bool main_rank, int64_t world_size,
                       int64_t warmup_steps, double peak_lr, int64_t global_batch, int64_t tokens_per_step,
                       bool resume, py::object moments, py::object reset_moments, py::object rollback_available,
                       py::object write_model) {
             GuardCoreOptions o;
             o.overrides = std::move(overrides);
             o.run_dir = std::move(run_dir);
             o.main_rank = main_rank;
             o.world_size = world_size;
             o.warmup_steps = warmup_steps;
             o.peak_lr = peak_lr;
             o.global_batch = global_batch;
             o.tokens_per_step = tokens_per_step;
             o.resume = resume;
             GuardCoreCallbacks cb{std::move(moments), std::move(reset_moments), std::move(rollback_available),
                                   std::move(write_model)};
             return std::make_unique<GuardCore>(std::move(params), std::move(names), std::move(o), std::move(cb));
           }),
           py::arg("params"), py::arg("names"), py::arg("overrides"), py::arg("run_dir"), py::arg("main_rank"),
           py::arg("world_size"), py::arg("warmup_steps"), py::arg("peak_lr"), py::arg("global_batch"),
           py::arg("tokens_per_step"), py::arg("resume"), py::arg("moments"), py::arg("reset_moments"),
           py::arg("rollback_available"), py::arg("write_model"))
      .def_property_readonly("loss_scale", &GuardCore::loss_scale)
      .def("lr_factor", &GuardCore::lr_factor, py::arg("step"))
      .def("compute_dtype", &GuardCore::compute_dtype, py::arg("step"))
      .def("noise_due", &GuardCore::noise_due, py::arg("step"))
      .def(
          "step",
          [](GuardCore& g, int64_t step, const at::Tensor& loss, std::optional<at::Tensor> micro_losses, double lr,
             std::optional<at::Tensor> noise_sq_norm, double noise_share, double noise_micro_batch,
             double noise_global_batch, const std::string& injected, std::optional<at::Tensor> inputs,
             std::optional<at::Tensor> targets, std::optional<at::Tensor> sample_index, int64_t tokens,
             std::optional<at::Tensor> z_loss) {
            CoreStepInputs in;
            in.inputs.loss = loss;
            if (z_loss) in.inputs.z_loss = *z_loss;
            if (micro_losses) in.inputs.micro_losses = *micro_losses;
            if (noise_sq_norm) in.inputs.noise_sq_norm = *noise_sq_norm;
            in.inputs.noise_share = noise_share;
            in.inputs.noise_micro_batch = noise_micro_batch;
            in.inputs.noise_global_batch = noise_global_batch;
            in.inputs.lr = lr;
            in.inputs.injected = injected;
            if (inputs) in.batch_inputs = *inputs;
            if (targets) in.batch_targets = *targets;
            if (sample_index) in.batch_sample_index = *sample_index;
            in.tokens = tokens;
            return g.step(step, in);
          },
          py::arg("step"), py::arg("loss"), py::arg("micro_losses"), py::arg("lr"), py::arg("noise_sq_norm"),
          py::arg("noise_share"), py::arg("noise_micro_batch"), py::arg("noise_global_batch"), py::arg("injected"),
          py::arg("inputs"), py::arg("targets"), py::arg("sample_index"), py::arg("tokens"),
          py::arg("z_loss") = py::none())
      .def("write_validation", &GuardCore::write_validation, py::arg("step"), py::arg("val_loss"))
      .def("write_event", &GuardCore::write_event, py::arg("json_object"))
      .def("state_dict", &GuardCore::state_dict)
      .def("load_state_dict", &GuardCore::load_state_dict, py::arg("json"), py::arg("rollback"))
      .def_property_readonly("config_yaml", [](const GuardCore& g) { return gradguard::config::to_yaml(g.config()); })
      .def_property_readonly("layer_names", &GuardCore::layer_names)
      .def_property_readonly("param_names", &GuardCore::param_names)
      .def_property_readonly("run_dir", &GuardCore::run_dir)
      .def_property_readonly("metrics_path", &GuardCore::metrics_path)
      .def_property_readonly("global_batch", &GuardCore::global_batch)
      .def_property_readonly("tokens_per_step", &GuardCore::tokens_per_step)
      .def_property_readonly("noise_every", [](const GuardCore& g) { return g.config().guard.noise_scale.every; })
      .def_property_readonly("snapshot_history",
                             [](const GuardCore& g) { return g.config().guard.snapshot.history; });
}
