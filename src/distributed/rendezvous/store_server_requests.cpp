// The store server's answers: the handshake (a client proves it holds the job's secret), then get,
// set, add, check, erase and try-get, and waking the connections parked on a key.
#include "distributed/rendezvous/net.h"
#include "distributed/rendezvous/secret.h"
#include "distributed/rendezvous/store_protocol.h"
#include "distributed/rendezvous/store_server_impl.h"
#include "tandem/error.h"

namespace tandem::dist {

using namespace store_detail;

void StoreServer::Impl::handshake(Conn& c, uint8_t op, const std::vector<std::string>& f) {
  const StoreAuth& auth = opt.auth;
  if (c.stage == Stage::Hello) {
    if (op != proto::kHello || f.size() != 3 || f[2].size() != proto::kNonceBytes) {
      log("handshake-first", "closed the connection from " + c.peer + ": it did not start with the store's handshake");
      return refuse(c, "a connection must start with the store's handshake (is the client a tandem process of "
                       "the same version?)");
    }
    if (f[0] != proto::kVersion) {
      log("handshake-version", "closed the connection from " + c.peer + ": it speaks " + f[0] + ", this store " +
                           proto::kVersion);
      return refuse(c, "this store speaks " + std::string(proto::kVersion) + ", the client " + f[0] +
                           " (every process of a job must run the same tandem)");
    }
    if (f[1] != auth.job_id) {
      log("job", "turned away a client from " + c.peer + " of job '" + f[1] + "': this store serves job '" +
                     auth.job_id + "'");
      return refuse(c, "this store serves job '" + auth.job_id + "', not job '" + f[1] + "'");
    }
    c.client_nonce = f[2];
    c.server_nonce = secret::random_bytes(proto::kNonceBytes);
    if (auth.secret.empty()) {
      c.stage = Stage::Ready;
      return reply(c, proto::kOk, {c.server_nonce, "open", ""});
    }
    std::string proof =
        secret::hmac_sha256(auth.secret, proto::proof_message("server", auth.job_id, c.client_nonce, c.server_nonce));
    c.stage = Stage::Auth;
    return reply(c, proto::kOk, {c.server_nonce, "secret", proof});
  }
  std::string expected =
      secret::hmac_sha256(auth.secret, proto::proof_message("client", auth.job_id, c.server_nonce, c.client_nonce));
  if (op != proto::kAuth || f.size() != 1 || !secret::equal(f[0], expected)) {
    log("secret", "turned away a client from " + c.peer + ": it does not know the job's secret");
    return refuse(c, "this process does not know the job's secret");
  }
  c.stage = Stage::Ready;
  reply(c, proto::kOk);
}

void StoreServer::Impl::handle(uint64_t id, Conn& c, uint8_t op, std::vector<std::string>& f) {
  auto need = [&](size_t n) {
    if (f.size() == n) return true;
    reply(c, proto::kError, {"malformed request"});
    return false;
  };
  // Stores value under key unless that takes the store past its limit; false (and a reply) then.
  auto put = [&](const std::string& key, std::string value) {
    auto it = data.find(key);
    size_t old = it == data.end() ? 0 : key.size() + it->second.size();
    size_t after = stored_bytes - old + key.size() + value.size();
    if (after > opt.limits.max_stored_bytes && after > stored_bytes) {
      log("stored", "refused to store key '" + key.substr(0, 64) + "' from " + c.peer + ": the store would hold " +
                        bytes_str(after) + ", more than its limit of " + bytes_str(opt.limits.max_stored_bytes));
      reply(c, proto::kError, {"the store is full: it holds at most " + bytes_str(opt.limits.max_stored_bytes)});
      return false;
    }
    stored_bytes = after;
    data[key] = std::move(value);
    return true;
  };
  switch (op) {
    case proto::kSet:
      if (!need(2) || !put(f[0], std::move(f[1]))) return;
      reply(c, proto::kOk);
      wake_waiters(f[0]);
      return;
    case proto::kGet: {
      if (!need(1)) return;
      auto it = data.find(f[0]);
      if (it != data.end()) {
        reply(c, proto::kOk, {it->second});
      } else {
        c.parked = true;
        c.parked_on = f[0];
        waiters[f[0]].push_back(id);
      }
      return;
    }
    case proto::kTryGet: {
      if (!need(1)) return;
      auto it = data.find(f[0]);
      if (it != data.end())
        reply(c, proto::kOk, {it->second});
      else
        reply(c, proto::kNotFound);
      return;
    }
    case proto::kAdd: {
      if (!need(2)) return;
      int64_t delta = 0, cur = 0;
      if (!parse_i64(f[1], delta)) return reply(c, proto::kError, {"add: the increment is not an integer"});
      auto it = data.find(f[0]);
      if (it != data.end() && !parse_i64(it->second, cur))
        return reply(c, proto::kError, {"add: key '" + f[0] + "' holds a value that is not an integer"});
      std::string v = std::to_string(cur + delta);
      if (!put(f[0], v)) return;
      reply(c, proto::kOk, {v});
      wake_waiters(f[0]);
      return;
    }
    case proto::kCheck: {
      bool all = true;
      for (const auto& k : f) all = all && data.count(k) > 0;
      reply(c, all ? proto::kOk : proto::kNotFound);
      return;
    }
    case proto::kErase: {
      if (!need(1)) return;
      auto it = data.find(f[0]);
      if (it == data.end()) return reply(c, proto::kNotFound);
      stored_bytes -= it->first.size() + it->second.size();
      data.erase(it);
      return reply(c, proto::kOk);
    }
    default:
      reply(c, proto::kError, {"unknown request " + std::to_string(op)});
  }
}

void StoreServer::Impl::reply(Conn& c, uint8_t status, const std::vector<std::string>& fields) {
  c.out += proto::encode(status, fields);
}

void StoreServer::Impl::refuse(Conn& c, const std::string& why) {
  reply(c, proto::kError, {why});
  c.closing = true;
}

void StoreServer::Impl::flush(Conn& c) {
  while (c.out_off < c.out.size()) {
    ssize_t w = send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (w > 0) {
      c.out_off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // poll reports when it drains
    c.dead = true;
    return;
  }
  c.out.clear();
  c.out_off = 0;
  if (c.closing) c.dead = true;
}

void StoreServer::Impl::wake_waiters(const std::string& key) {
  auto w = waiters.find(key);
  if (w == waiters.end()) return;
  std::vector<uint64_t> ids = std::move(w->second);
  waiters.erase(w);
  const std::string& value = data[key];
  for (uint64_t wid : ids) {
    auto it = conns.find(wid);
    if (it == conns.end() || it->second.dead || !it->second.parked) continue;
    Conn& wc = it->second;
    wc.parked = false;
    wc.parked_on.clear();
    reply(wc, proto::kOk, {value});
    schedule(wid, wc);  // its next requests run from the queue, not from inside this one
  }
}

}  // namespace tandem::dist
