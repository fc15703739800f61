// Compiled with the store area's flags: its own private header is visible.
#include "store/reserved_keys.h"

int main() {
  return 0;
}
