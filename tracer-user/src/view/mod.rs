//! `ttrace view`: an HTTP server over one trace, answering the typed
//! queries of docs/VIEW_API.md for the embedded front end. On the offline
//! path: it reads through [`crate::format`] and computes through
//! [`crate::analyze`], whose figures it never recomputes; [`index`]
//! only files them into columns the queries scan.

pub mod api;
pub mod assets;
pub mod background;
pub mod cache;
pub mod frame;
pub mod index;
pub mod params;
pub mod server;
