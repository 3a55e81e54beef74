/*
 * nccl.h of liboxccl_nccl: the NCCL 2.28 C API (types, values and prototypes), written for
 * oxccl so that programs compile against it and link against liboxccl_nccl.so, or against
 * NVIDIA's nccl.h and run with liboxccl_nccl.so preloaded: the ABI is the same.
 *
 * Every function returns an ncclResult_t unless noted; ncclGetLastError() gives the reason
 * of the calling thread's last failure. See docs/nccl-api.md for what oxccl serves and what
 * it forwards to the real NCCL.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22800
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* A CUDA stream, without needing the CUDA headers (the same type as the runtime's). */
#if !defined(__CUDA_RUNTIME_H__) && !defined(__DRIVER_TYPES_H__)
typedef struct CUstream_st* cudaStream_t;
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#define NCCL_REVOKE_DEFAULT 0x00

/* Communicator options (layout of NCCL 2.28's ncclConfig_v22800). */
typedef struct ncclConfig_v22800 {
  size_t size;          /* set by NCCL_CONFIG_INITIALIZER */
  unsigned int magic;   /* 0xcafebeef */
  unsigned int version; /* NCCL_VERSION of the header */
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                             \
  {                                                                                         \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),     \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                        \
  }

typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

/* Reduction operators: 0..4 built in; ncclRedOpCreatePreMulSum makes more. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Each function F below is also exported as pF (NCCL's profiling interface). */
#define OXCCL_NCCL_DECLARE(ret, name, args) ret name args; ret p##name args;

OXCCL_NCCL_DECLARE(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclMemFree, (void* ptr))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclGetVersion, (int* version))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclGetUniqueId, (ncclUniqueId* uniqueId))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommInitRankConfig,
                   (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommInitRank,
                   (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommInitAll, (ncclComm_t* comm, int ndev, const int* devlist))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommAbort, (ncclComm_t comm))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommSplit,
                   (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommShrink,
                   (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                    ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommInitRankScalable,
                   (ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                    ncclConfig_t* config))
OXCCL_NCCL_DECLARE(const char*, ncclGetErrorString, (ncclResult_t result))
OXCCL_NCCL_DECLARE(const char*, ncclGetLastError, (ncclComm_t comm))
OXCCL_NCCL_DECLARE(void, ncclResetDebugInit, (void))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommRegister,
                   (const ncclComm_t comm, void* buff, size_t size, void** handle))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommWindowRegister,
                   (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclRedOpCreatePreMulSum,
                   (ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                    ncclScalarResidence_t residence, ncclComm_t comm))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclReduce,
                   (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclBcast,
                   (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                    cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclBroadcast,
                   (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    int root, ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclAllReduce,
                   (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclReduceScatter,
                   (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclAllGather,
                   (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                    ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclAlltoAll,
                   (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclGather,
                   (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    int root, ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclScatter,
                   (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    int root, ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclSend,
                   (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclRecv,
                   (void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                    ncclComm_t comm, cudaStream_t stream))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclGroupStart, (void))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclGroupEnd, (void))
OXCCL_NCCL_DECLARE(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t* simInfo))

#undef OXCCL_NCCL_DECLARE

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
