#pragma once

// One error hierarchy for all of tdist. Messages name the rank, the operation and the fix;
// every error is stamped with the file and line that raised it (see TDIST_THROW).

#include <exception>
#include <stdexcept>
#include <string>

namespace tdist {

/// Base of every error tdist raises.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A caller passed a value that can never work (bad rank, unknown backend, bad shape...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A blocking call ran past its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// A store request failed (connection lost, key missing after wait, auth refused...).
class StoreError : public Error {
 public:
  using Error::Error;
};

/// A non-blocking Store::queue_pop found its queue empty (c10d's QueueEmptyError).
class QueueEmptyError : public StoreError {
 public:
  using StoreError::StoreError;
};

/// A peer went away or the network failed while a collective was running.
class NetworkError : public Error {
 public:
  using Error::Error;
};

/// A backend failed a collective (mismatch across ranks, broken group, unsupported op...).
class DistBackendError : public Error {
 public:
  using Error::Error;
};

/// A checkpoint is missing, incomplete or corrupt.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// The message a captured exception carries: its what(), or `fallback` when it is not a
/// std::exception (or there is none). Failure paths that hold an exception_ptr report it
/// without rethrowing it themselves.
std::string message_of(const std::exception_ptr& error,
                       const std::string& fallback = "unknown error");

namespace detail {
std::string stamp(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace tdist

/// Throws ErrorType with a message stamped "file:line".
#define TDIST_THROW(ErrorType, message) \
  throw ErrorType(::tdist::detail::stamp(__FILE__, __LINE__, (message)))

/// Throws tdist::InvalidArgument unless cond holds.
#define TDIST_CHECK_ARG(cond, message)                             \
  do {                                                             \
    if (!(cond)) TDIST_THROW(::tdist::InvalidArgument, (message)); \
  } while (0)
