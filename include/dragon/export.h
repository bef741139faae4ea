/*
 * dragon — the mark of the public API.
 *
 * libdragon is built with -fvisibility=hidden: a function is in the
 * shared library's interface only when its declaration in an installed
 * header (include/dragon/) begins with DG_API. Everything else the
 * library's files share is declared in headers beside their sources,
 * which are not installed, and stays inside the library. A program sees
 * DG_API as plain default visibility, so the headers need no setting to
 * be used.
 */
#ifndef DRAGON_EXPORT_H
#define DRAGON_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define DG_API __attribute__((visibility("default")))
#else
#define DG_API
#endif

#endif /* DRAGON_EXPORT_H */
