#include "tests/kvtransfer/fake_data_receiver.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::testing {

FakeDataReceiver::FakeDataReceiver(KvTransport transport, const RefKv* source,
                                   VectorKvWriter* dest)
    : transport_(transport), source_(source), dest_(dest) {
  worker_ = std::thread([this] { Run(); });
}

FakeDataReceiver::~FakeDataReceiver() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    held_ = false;
  }
  worker_.join();
}

std::string FakeDataReceiver::Name(const TransferKey& k) {
  return absl::StrCat(k.request_id, "/", k.attempt);
}

absl::Status FakeDataReceiver::OpenTransfer(const TransferKey& key,
                                            std::string_view transport_setup,
                                            const DeviceKvTarget& target) {
  absl::MutexLock l(&mu_);
  log_.push_back(absl::StrCat("open ", Name(key)));
  setups_.emplace_back(transport_setup);
  target_ = &target;
  return open_error_;
}

void FakeDataReceiver::Receive(const TransferKey& key, const FrameDescriptor& frame,
                               std::function<void(absl::Status)> done) {
  absl::MutexLock l(&mu_);
  const int index = static_cast<int>(frames_.size());
  log_.push_back(absl::StrCat("receive ", Name(key), " #", index));
  frames_.push_back(frame);
  Job job{index, key, frame, std::move(done), nullptr, absl::OkStatus()};
  if (auto it = fail_.find(index); it != fail_.end()) job.fail = it->second;
  jobs_.push_back(std::move(job));
}

void FakeDataReceiver::CloseTransfer(const TransferKey& key, std::function<void()> quiesced) {
  absl::MutexLock l(&mu_);
  log_.push_back(absl::StrCat("close ", Name(key)));
  ++closes_;
  closed_.insert(Name(key));
  jobs_.push_back(Job{-1, key, {}, nullptr, std::move(quiesced), absl::OkStatus()});
}

uint64_t FakeDataReceiver::bytes_total() const {
  absl::MutexLock l(&mu_);
  return bytes_;
}

void FakeDataReceiver::Run() {
  for (;;) {
    Job job;
    bool closed = false;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (!held_ && !jobs_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      closed = closed_.count(Name(job.key)) != 0;
      if (job.quiesced) log_.push_back(absl::StrCat("quiesced ", Name(job.key)));
    }
    if (job.quiesced) {
      job.quiesced();
      continue;
    }
    absl::Status s = job.fail;
    if (closed && s.ok()) s = absl::CancelledError("transfer closed");
    if (s.ok()) {
      const FrameDescriptor& f = job.frame;
      dest_->WriteRows(f.layer, f.token_start, f.token_count,
                       source_->K(f.layer, f.token_start), source_->V(f.layer, f.token_start));
    }
    {
      absl::MutexLock l(&mu_);
      if (s.ok()) bytes_ += 2 * uint64_t{job.frame.token_count} * source_->row_bytes();
      log_.push_back(absl::StrCat("received ", Name(job.key), " #", job.index, " ",
                                  absl::StatusCodeToString(s.code())));
    }
    job.done(s);
  }
}

void FakeDataReceiver::Hold() {
  absl::MutexLock l(&mu_);
  held_ = true;
}

void FakeDataReceiver::Release() {
  absl::MutexLock l(&mu_);
  held_ = false;
}

void FakeDataReceiver::FailOpen(absl::Status s) {
  absl::MutexLock l(&mu_);
  open_error_ = std::move(s);
}

void FakeDataReceiver::FailFrame(int index, absl::Status s) {
  absl::MutexLock l(&mu_);
  fail_[index] = std::move(s);
}

void FakeDataReceiver::Log(const std::string& line) {
  absl::MutexLock l(&mu_);
  log_.push_back(line);
}

bool FakeDataReceiver::WaitFrames(size_t n, std::chrono::milliseconds timeout) {
  absl::MutexLock l(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frames_.size() >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
}

bool FakeDataReceiver::WaitCloses(size_t n, std::chrono::milliseconds timeout) {
  absl::MutexLock l(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<size_t>(closes_) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
}

std::vector<FrameDescriptor> FakeDataReceiver::frames() const {
  absl::MutexLock l(&mu_);
  return frames_;
}

std::vector<std::string> FakeDataReceiver::setups() const {
  absl::MutexLock l(&mu_);
  return setups_;
}

std::vector<std::string> FakeDataReceiver::log() const {
  absl::MutexLock l(&mu_);
  return log_;
}

int FakeDataReceiver::closes() const {
  absl::MutexLock l(&mu_);
  return closes_;
}

const DeviceKvTarget* FakeDataReceiver::last_target() const {
  absl::MutexLock l(&mu_);
  return target_;
}

std::optional<absl::Status> WaitQueueResult(KvSendQueue& queue, KvSendQueue::TransferId id,
                                            std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::optional<absl::Status> r = queue.Result(id);
    if (r.has_value() || std::chrono::steady_clock::now() >= until) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int LogPos(const std::vector<std::string>& log, const std::string& entry) {
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i] == entry) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace tandem::kvtransfer::testing
