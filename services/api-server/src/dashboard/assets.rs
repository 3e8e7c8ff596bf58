//! The dashboard's pages and scripts, compiled into the binary (no CDN: it works offline):
//! `web/` of this crate, and uPlot, which `build.rs` copies in.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// (name under `/assets/`, content type, content)
const FILES: [(&str, &str, &str); 4] = [
    (
        "app.js",
        "text/javascript",
        include_str!("../../web/app.js"),
    ),
    ("style.css", "text/css", include_str!("../../web/style.css")),
    (
        "uplot.js",
        "text/javascript",
        include_str!(concat!(env!("OUT_DIR"), "/uplot.js")),
    ),
    (
        "uplot.css",
        "text/css",
        include_str!(concat!(env!("OUT_DIR"), "/uplot.css")),
    ),
];

pub(super) async fn index() -> Response {
    let page = include_str!("../../web/index.html");
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

pub(super) async fn file(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(file, _, _)| *file == name) {
        Some((_, content_type, content)) => {
            ([(header::CONTENT_TYPE, *content_type)], *content).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}
