// A downstream program: opens the host device, copies through two streams
// joined by an event, and checks the bytes.
#include <sparse_mla/sparse_mla.hpp>

#include <cstdio>
#include <cstring>

int main() {
  auto device = sparse_mla::open_device("host");
  auto a = device->create_stream();
  auto b = device->create_stream();
  auto ready = device->create_event();
  sparse_mla::Buffer x = device->allocate(1024, sparse_mla::MemoryKind::device);
  sparse_mla::Buffer y = device->allocate(1024, sparse_mla::MemoryKind::host);
  a->fill(x, 0, 42, x.bytes());
  ready->record(*a);
  b->wait(*ready);
  b->copy(y, 0, x, 0, x.bytes());
  b->synchronize();
  for (std::size_t i = 0; i < y.bytes(); ++i) {
    if (y.as<unsigned char>()[i] != 42) {
      std::printf("byte %zu is %d, expected 42\n", i, y.as<unsigned char>()[i]);
      return 1;
    }
  }
  std::printf("consumer: ok\n");
  return 0;
}
