#include "server/metrics/request_metrics.h"

#include <memory>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"

namespace gradserve::server::metrics {
namespace {

constexpr int kCodes = 17;  // absl::StatusCode's (gRPC's) codes, 0 to 16

// The duration histograms: total, then the engine's stages.
enum Stage { kTotal, kQueue, kForward, kBackward, kStages };

constexpr const char* kStageFamilies[kStages] = {
    "gradserve_request_duration_seconds", "gradserve_queue_duration_seconds",
    "gradserve_forward_duration_seconds", "gradserve_backward_duration_seconds"};
constexpr const char* kStageHelp[kStages] = {
    "Calls that ended (grad calls once admitted; Ping, GetServerInfo and Release all): "
    "received to status known.",
    "Admitted grad calls that reached the engine: admitted to picked up by a thread.",
    "Admitted grad calls that reached the engine: validation and forward pass (graph recorded).",
    "Admitted grad calls that reached the engine: every backward call."};

void Add(std::atomic<int64_t>& counter, int64_t n) {
  counter.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace

struct RequestMetrics::Series {
  std::atomic<int64_t> calls[kCodes];
  std::atomic<int64_t> buckets[kStages][kBuckets];
  std::atomic<int64_t> sum_us[kStages];
  std::atomic<int64_t> bytes_in;
  std::atomic<int64_t> bytes_out;
  std::atomic<int64_t> nodes;
  std::atomic<int64_t> rejected[kRejectReasons];
};

const char* RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kComputeGradients:
      return "ComputeGradients";
    case Rpc::kComputeGradientsStream:
      return "ComputeGradientsStream";
    case Rpc::kForward:
      return "Forward";
    case Rpc::kBackward:
      return "Backward";
    case Rpc::kExtend:
      return "Extend";
    case Rpc::kRelease:
      return "Release";
    case Rpc::kRegisterSharedMemory:
      return "RegisterSharedMemory";
    case Rpc::kUnregisterSharedMemory:
      return "UnregisterSharedMemory";
    case Rpc::kPing:
      return "Ping";
    case Rpc::kGetServerInfo:
      return "GetServerInfo";
  }
  return "";
}

const char* RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kUnauthenticated:
      return "unauthenticated";
    case RejectReason::kDraining:
      return "draining";
    case RejectReason::kServerFull:
      return "server_full";
    case RejectReason::kTenantFull:
      return "tenant_full";
    case RejectReason::kUploadsFull:
      return "uploads_full";
    case RejectReason::kUploadIdle:
      return "upload_idle";
    case RejectReason::kUploadTooLarge:
      return "upload_too_large";
    case RejectReason::kUploadMemory:
      return "upload_memory";
    case RejectReason::kUploadMalformed:
      return "upload_malformed";
    case RejectReason::kCancelled:
      return "cancelled";
  }
  return "";
}

RequestMetrics::RequestMetrics() = default;

RequestMetrics::~RequestMetrics() {
  for (auto& shard : series_) {
    for (auto& rpc : shard) {
      for (std::atomic<Series*>& series : rpc) delete series.load();
    }
  }
}

RequestMetrics::Series& RequestMetrics::Get(Rpc rpc, int tenant_slot) {
  std::atomic<Series*>& slot = series_[ThisThreadShard()][static_cast<int>(rpc)][tenant_slot];
  Series* series = slot.load(std::memory_order_acquire);
  if (series != nullptr) return *series;
  auto fresh = std::unique_ptr<Series>(new Series());  // value-initialized: all zero
  if (slot.compare_exchange_strong(series, fresh.get(), std::memory_order_acq_rel)) {
    return *fresh.release();
  }
  return *series;  // another thread of this shard made it first
}

void RequestMetrics::Ended(Rpc rpc, int tenant_slot, absl::StatusCode code, const CallTimes& times,
                           int64_t nodes, int64_t bytes_in, int64_t bytes_out) {
  Series& s = Get(rpc, tenant_slot);
  const int c = static_cast<int>(code);
  Add(s.calls[c >= 0 && c < kCodes ? c : static_cast<int>(absl::StatusCode::kUnknown)], 1);
  auto observe = [&s](Stage stage, int64_t us) {
    Add(s.buckets[stage][BucketOf(us)], 1);
    Add(s.sum_us[stage], us);
  };
  observe(kTotal, times.total_us);
  if (times.ran) {
    observe(kQueue, times.queue_us);
    observe(kForward, times.forward_us);
    observe(kBackward, times.backward_us);
  }
  if (nodes != 0) Add(s.nodes, nodes);
  Add(s.bytes_in, bytes_in);
  if (bytes_out != 0) Add(s.bytes_out, bytes_out);
}

void RequestMetrics::Rejected(Rpc rpc, int tenant_slot, RejectReason reason) {
  Add(Get(rpc, tenant_slot).rejected[static_cast<int>(reason)], 1);
}

void RequestMetrics::Write(TextWriter* out,
                           absl::FunctionRef<std::string(int slot)> tenant_label) const {
  // The shards summed, for each (rpc, tenant) pair in use.
  struct Totals {
    Rpc rpc;
    std::string tenant;
    int64_t calls[kCodes] = {};
    int64_t buckets[kStages][kBuckets] = {};
    int64_t sum_us[kStages] = {};
    int64_t bytes_in = 0, bytes_out = 0, nodes = 0;
    int64_t rejected[kRejectReasons] = {};
  };
  std::vector<Totals> totals;
  for (int r = 0; r < kRpcs; ++r) {
    for (int slot = 0; slot < kTenantSlots; ++slot) {
      Totals* t = nullptr;
      for (int shard = 0; shard < kShards; ++shard) {
        const Series* s = series_[shard][r][slot].load(std::memory_order_acquire);
        if (s == nullptr) continue;
        if (t == nullptr) {
          t = &totals.emplace_back();
          t->rpc = static_cast<Rpc>(r);
          t->tenant = slot == 0                 ? std::string()
                      : slot == kMaxTenants + 1 ? std::string("_other")
                                                : tenant_label(slot);
        }
        auto get = [](const std::atomic<int64_t>& a) { return a.load(std::memory_order_relaxed); };
        for (int c = 0; c < kCodes; ++c) t->calls[c] += get(s->calls[c]);
        for (int st = 0; st < kStages; ++st) {
          for (int b = 0; b < kBuckets; ++b) t->buckets[st][b] += get(s->buckets[st][b]);
          t->sum_us[st] += get(s->sum_us[st]);
        }
        t->bytes_in += get(s->bytes_in);
        t->bytes_out += get(s->bytes_out);
        t->nodes += get(s->nodes);
        for (int k = 0; k < kRejectReasons; ++k) t->rejected[k] += get(s->rejected[k]);
      }
    }
  }

  out->Family("gradserve_requests_total", "counter",
              "Calls that ended (grad calls once admitted; Ping, GetServerInfo and Release "
              "all), by rpc, gRPC status code and tenant.");
  for (const Totals& t : totals) {
    for (int c = 0; c < kCodes; ++c) {
      if (t.calls[c] == 0) continue;
      out->Sample("gradserve_requests_total",
                  {{"rpc", RpcName(t.rpc)},
                   {"status", absl::StatusCodeToString(static_cast<absl::StatusCode>(c))},
                   {"tenant", t.tenant}},
                  t.calls[c]);
    }
  }
  for (int st = 0; st < kStages; ++st) {
    out->Family(kStageFamilies[st], "histogram", kStageHelp[st]);
    for (const Totals& t : totals) {
      // The engine's stages only for rpcs whose calls reached it (not Ping's, for one).
      if (st != kTotal && absl::c_all_of(t.buckets[st], [](int64_t n) { return n == 0; })) {
        continue;
      }
      out->Histogram(kStageFamilies[st], {{"rpc", RpcName(t.rpc)}, {"tenant", t.tenant}},
                     t.buckets[st], t.sum_us[st]);
    }
  }
  out->Family("gradserve_rejected_total", "counter",
              "Grad calls refused before they were admitted, by rpc, reason and tenant.");
  for (const Totals& t : totals) {
    for (int k = 0; k < kRejectReasons; ++k) {
      if (t.rejected[k] == 0) continue;
      out->Sample("gradserve_rejected_total",
                  {{"rpc", RpcName(t.rpc)},
                   {"reason", RejectReasonName(static_cast<RejectReason>(k))},
                   {"tenant", t.tenant}},
                  t.rejected[k]);
    }
  }
  struct Counter {
    const char* name;
    const char* help;
    int64_t Totals::*field;
  };
  for (const Counter& c :
       {Counter{"gradserve_received_bytes_total",
                "Bytes of admitted grad requests (serialized, decompressed).", &Totals::bytes_in},
        Counter{"gradserve_sent_bytes_total", "Bytes of grad responses (serialized).",
                &Totals::bytes_out},
        Counter{"gradserve_nodes_total", "Autograd Nodes recorded by admitted grad calls.",
                &Totals::nodes}}) {
    out->Family(c.name, "counter", c.help);
    for (const Totals& t : totals) {
      out->Sample(c.name, {{"rpc", RpcName(t.rpc)}, {"tenant", t.tenant}}, t.*c.field);
    }
  }
}

}  // namespace gradserve::server::metrics
