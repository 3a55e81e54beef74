// A GPU timeline of any CUDA program, for questions such as "did this copy-engine copy run
// beside that kernel?": loaded with LD_PRELOAD, it records through CUPTI's activity API
// every kernel, copy and fill the process runs on a GPU, and at exit writes one line per
// record to $OXCCL_TRACE_DIR/trace-<pid>.txt (default /tmp), sorted by start:
//
//     start_ns end_ns kind device stream channel_type channel what
//
// kind K (kernel; what = name and grid x block), C (copy; what = copy kind and bytes), P
// (peer copy; what = source and destination device and bytes), S (fill; what = bytes).
// channel: the GPU work queue the record ran on (CUPTI's channelID/channelType), which
// shows whether two streams were given one queue. Build (ci/gpu/build-bandwidth-probe.sh):
//
//     gcc -shared -fPIC -O2 -I<cupti include> gpu_trace.c -L<cupti lib> -lcupti -o libgpu_trace.so
//     OXCCL_TRACE_DIR=out LD_PRELOAD=libgpu_trace.so LD_LIBRARY_PATH=<cupti lib> program ...
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUFFER_BYTES (8u << 20)

typedef struct {
  uint64_t start, end;
  char line[224];
} Record;

static Record* records;
static size_t used, capacity;

static void add(uint64_t start, uint64_t end, const char* line) {
  if (used == capacity) {
    size_t grown = capacity ? 2 * capacity : 4096;
    Record* r = realloc(records, grown * sizeof(Record));
    if (r == NULL) return;  // out of memory: the trace loses records, the program goes on
    records = r;
    capacity = grown;
  }
  records[used].start = start;
  records[used].end = end;
  snprintf(records[used].line, sizeof(records[used].line), "%s", line);
  ++used;
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = aligned_alloc(8, BUFFER_BYTES);
  *size = *buffer ? BUFFER_BYTES : 0;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity* rec = NULL;
  char line[224];
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)rec;
        snprintf(line, sizeof(line), "K %u %u %d %u %s %dx%d", k->deviceId, k->streamId, (int)k->channelType,
                 k->channelID, k->name ? k->name : "?", k->gridX, k->blockX);
        add(k->start, k->end, line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6* m = (const CUpti_ActivityMemcpy6*)rec;
        snprintf(line, sizeof(line), "C %u %u %d %u kind=%u bytes=%llu", m->deviceId, m->streamId,
                 (int)m->channelType, m->channelID, (unsigned)m->copyKind, (unsigned long long)m->bytes);
        add(m->start, m->end, line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY2: {
        const CUpti_ActivityMemcpyPtoP4* m = (const CUpti_ActivityMemcpyPtoP4*)rec;
        snprintf(line, sizeof(line), "P %u %u %d %u src=%u dst=%u bytes=%llu", m->deviceId, m->streamId,
                 (int)m->channelType, m->channelID, m->srcDeviceId, m->dstDeviceId, (unsigned long long)m->bytes);
        add(m->start, m->end, line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4* m = (const CUpti_ActivityMemset4*)rec;
        snprintf(line, sizeof(line), "S %u %u %d %u bytes=%llu", m->deviceId, m->streamId, (int)m->channelType,
                 m->channelID, (unsigned long long)m->bytes);
        add(m->start, m->end, line);
        break;
      }
      default:
        break;
    }
  }
  free(buffer);
}

static int by_start(const void* a, const void* b) {
  const Record* x = a;
  const Record* y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

static void write_trace(void) {
  cuptiActivityFlushAll(1);
  const char* dir = getenv("OXCCL_TRACE_DIR");
  char path[512];
  snprintf(path, sizeof(path), "%s/trace-%d.txt", dir && *dir ? dir : "/tmp", (int)getpid());
  FILE* out = fopen(path, "w");
  if (out == NULL) {
    fprintf(stderr, "gpu_trace: cannot write %s\n", path);
    return;
  }
  qsort(records, used, sizeof(Record), by_start);
  for (size_t i = 0; i < used; ++i) {
    fprintf(out, "%llu %llu %s\n", (unsigned long long)records[i].start, (unsigned long long)records[i].end,
            records[i].line);
  }
  fclose(out);
  fprintf(stderr, "gpu_trace: %zu records in %s\n", used, path);
}

__attribute__((constructor)) static void start_trace(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    fprintf(stderr, "gpu_trace: CUPTI refused the callbacks; no trace\n");
    return;
  }
  const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                      CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_MEMSET};
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); ++i) {
    if (cuptiActivityEnable(kinds[i]) != CUPTI_SUCCESS) fprintf(stderr, "gpu_trace: activity %d not traced\n", (int)kinds[i]);
  }
  atexit(write_trace);
}
