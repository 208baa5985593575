// Grad mode: whether ops record autograd history on this thread.
//
// Per thread, never process-wide, so one request cannot flip it for another. The Engine sets it
// to the GraphTask's create_graph while a backward function runs.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_GRAD_MODE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_GRAD_MODE_H_

namespace gradserve::autograd {

class GradMode {
 public:
  static bool is_enabled() { return enabled_; }
  static void set_enabled(bool enabled) { enabled_ = enabled; }

 private:
  // Inline and constant-initialized, so every translation unit reaches it directly rather than
  // through a thread-local wrapper function (which UndefinedBehaviorSanitizer trips on when the
  // variable is defined in another file).
  static inline thread_local bool enabled_ = true;
};

// Sets grad mode for a scope and restores the previous mode after.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : previous_(GradMode::is_enabled()) {
    GradMode::set_enabled(enabled);
  }
  ~GradModeGuard() { GradMode::set_enabled(previous_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  const bool previous_;
};

// torch.no_grad().
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_GRAD_MODE_H_
