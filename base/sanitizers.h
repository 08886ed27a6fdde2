// Which sanitizer this translation unit is built under, for the few places whose behaviour or
// expectations differ (ASan takes memory from its heap, not from mmap; tests of resident size
// cannot hold under ASan or TSan). GCC defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, Clang
// answers __has_feature.
//   PS_ASAN, PS_TSAN: 1 or 0, for #if (e.g. around <sanitizer/asan_interface.h>);
//   ps::kAsan, ps::kTsan: the same as constexpr bools.
#ifndef PATRICKSTAR_BASE_SANITIZERS_H_
#define PATRICKSTAR_BASE_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__)
#define PS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PS_ASAN 1
#endif
#endif
#ifndef PS_ASAN
#define PS_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define PS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PS_TSAN 1
#endif
#endif
#ifndef PS_TSAN
#define PS_TSAN 0
#endif

namespace ps {

inline constexpr bool kAsan = PS_ASAN == 1;
inline constexpr bool kTsan = PS_TSAN == 1;

}  // namespace ps

#endif  // PATRICKSTAR_BASE_SANITIZERS_H_
